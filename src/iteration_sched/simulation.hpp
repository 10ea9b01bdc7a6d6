#include "salus/simulation.hpp"  // the simulator's API is public now
