"""The CUDA driver through ctypes: what the benchmark needs that PyTorch does not offer.

* ``Driver``: libcuda's entry points by name, resolved with ``cuGetProcAddress_v2`` as Salus
  resolves them (src/cuda/driver_api.cpp: it knows which versioned symbol, ``_v2`` and so on, a
  base name stands for), each call's ``CUresult`` returned with its name.
* ``StampKernel``: a one-thread kernel, loaded from PTX (no compiler needed: the driver JITs it),
  that reads the GPU's global nanosecond timer (``%globaltimer``) when it starts, spins for a
  given time, and writes its start and end. The timer is one clock for the whole GPU, so the
  stamps of kernels of different streams and different processes compare: a gap between two
  processes' kernels is measurable, which CUDA events (one process's own) cannot give.

Run as a script it is the child of the pre-flight's interprocess-event probe (preflight.py):
``cuda_driver.py open-ipc-event HEX`` opens the handle and prints what the driver returned.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional

CUDA_SUCCESS = 0
CU_EVENT_DISABLE_TIMING = 0x2
CU_EVENT_INTERPROCESS = 0x4
_API_VERSION = 12000  # the driver API version Salus asks for (kDriverApiVersion)

CUresult = ctypes.c_int
_void_p = ctypes.c_void_p
_p_void_p = ctypes.POINTER(ctypes.c_void_p)


class CUipcEventHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


# Name -> (argument types). The return type is always CUresult.
_PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (ctypes.POINTER(ctypes.c_int),),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (_p_void_p, ctypes.c_int),
    "cuDevicePrimaryCtxRelease": (ctypes.c_int,),
    "cuCtxGetCurrent": (_p_void_p,),
    "cuCtxSetCurrent": (_void_p,),
    "cuCtxSynchronize": (),
    "cuEventCreate": (_p_void_p, ctypes.c_uint),
    "cuEventDestroy": (_void_p,),
    "cuEventQuery": (_void_p,),
    "cuEventRecord": (_void_p, _void_p),
    "cuIpcGetEventHandle": (ctypes.POINTER(CUipcEventHandle), _void_p),
    "cuIpcOpenEventHandle": (_p_void_p, CUipcEventHandle),
    "cuModuleLoadData": (_p_void_p, ctypes.c_char_p),
    "cuModuleGetFunction": (_p_void_p, _void_p, ctypes.c_char_p),
    "cuLaunchKernel": (_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, _void_p, _p_void_p,
                       _p_void_p),
}


class DriverError(RuntimeError):
    """A driver call returned an error: the call, the CUresult's name and number."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {name} ({code})")
        self.call, self.code, self.name = call, code, name


class Driver:
    """libcuda.so.1, its entry points resolved by base name."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as e:
            raise DriverError("dlopen(libcuda.so.1)", -1, f"not loadable: {e}") from e
        self._fns: dict[str, Any] = {}
        self._get_proc = getattr(self.lib, "cuGetProcAddress_v2", None)
        if self._get_proc is not None:
            self._get_proc.restype = CUresult
            self._get_proc.argtypes = [ctypes.c_char_p, _p_void_p, ctypes.c_int,
                                       ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        self._error_name = self.lib.cuGetErrorName
        self._error_name.restype = CUresult
        self._error_name.argtypes = [CUresult, ctypes.POINTER(ctypes.c_char_p)]

    def name_of(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self._error_name(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
            return text.value.decode()
        return f"CUDA_ERROR_{code}"

    def fn(self, name: str) -> Any:
        """The entry point ``name`` with its prototype."""
        if name not in self._fns:
            proto = ctypes.CFUNCTYPE(CUresult, *_PROTOTYPES[name])
            self._fns[name] = proto(self._address(name))
        return self._fns[name]

    def _address(self, name: str) -> int:
        if self._get_proc is not None:
            address = ctypes.c_void_p()
            status = ctypes.c_int(-1)
            rc = self._get_proc(name.encode(), ctypes.byref(address), _API_VERSION, 0,
                                ctypes.byref(status))
            if rc == CUDA_SUCCESS and status.value == 0 and address.value:
                return address.value
        # An older driver (no cuGetProcAddress_v2): the symbol itself, versioned if it is.
        for symbol in (f"{name}_v2", name):
            address = ctypes.cast(getattr(self.lib, symbol, None) or 0, ctypes.c_void_p)
            if address.value:
                return address.value
        raise DriverError(f"cuGetProcAddress({name})", -1, "entry point not found")

    def call(self, name: str, *args: Any) -> tuple[int, str]:
        """Calls ``name``; its CUresult and the result's name (errors are returned, not raised:
        the probe reports them)."""
        rc = int(self.fn(name)(*args))
        return rc, self.name_of(rc)

    def check(self, name: str, *args: Any) -> None:
        rc, text = self.call(name, *args)
        if rc != CUDA_SUCCESS:
            raise DriverError(name, rc, text)

    def primary_context(self, device: int = 0) -> int:
        """Initializes the driver and makes device ``device``'s primary context current (the one
        PyTorch and Salus use)."""
        self.check("cuInit", 0)
        dev = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(dev), device)
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
        self.check("cuCtxSetCurrent", ctx)
        return int(ctx.value or 0)

    def version(self) -> int:
        v = ctypes.c_int()
        self.check("cuDriverGetVersion", ctypes.byref(v))
        return v.value


# The stamp kernel: one thread reads %globaltimer, spins until spin_ns have passed on it, and
# writes (start, end) to out[0], out[1]. PTX 6.0 for sm_60 runs on every GPU since Pascal: the
# driver compiles it for the GPU it runs on.
STAMP_PTX = rb"""
.version 6.0
.target sm_60
.address_size 64

.visible .entry salus_bench_stamp(
    .param .u64 salus_bench_stamp_out,
    .param .u64 salus_bench_stamp_spin
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [salus_bench_stamp_out];
    ld.param.u64 %rd2, [salus_bench_stamp_spin];
    cvta.to.global.u64 %rd3, %rd1;
    mov.u64 %rd4, %globaltimer;
    add.s64 %rd5, %rd4, %rd2;
$L_spin:
    mov.u64 %rd6, %globaltimer;
    setp.lt.u64 %p1, %rd6, %rd5;
    @%p1 bra $L_spin;
    st.global.u64 [%rd3], %rd4;
    st.global.u64 [%rd3+8], %rd6;
    ret;
}
"""


class StampKernel:
    """Launches the stamp kernel on a stream (a ``CUstream`` handle: PyTorch's
    ``stream.cuda_stream``) into a device buffer of int64 pairs. Load it after PyTorch has
    initialized CUDA: the module goes into the primary context current on this thread."""

    def __init__(self, driver: Optional[Driver] = None) -> None:
        self.driver = driver or Driver()
        current = ctypes.c_void_p()
        self.driver.check("cuCtxGetCurrent", ctypes.byref(current))
        if not current.value:
            self.driver.primary_context()
            self.driver.check("cuCtxGetCurrent", ctypes.byref(current))
        self.context = current.value
        module = ctypes.c_void_p()
        self.driver.check("cuModuleLoadData", ctypes.byref(module), STAMP_PTX + b"\0")
        function = ctypes.c_void_p()
        self.driver.check("cuModuleGetFunction", ctypes.byref(function), module,
                          b"salus_bench_stamp")
        self.function = function

    def launch(self, stream: int, out_ptr: int, spin_ns: int) -> None:
        """One kernel on ``stream`` writing its (start, end) in ns at ``out_ptr``."""
        self._ensure_context()
        out = ctypes.c_uint64(out_ptr)
        spin = ctypes.c_uint64(spin_ns)
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(spin), ctypes.c_void_p))
        self.driver.check("cuLaunchKernel", self.function, 1, 1, 1, 1, 1, 1, 0,
                          ctypes.c_void_p(stream), params, None)

    def _ensure_context(self) -> None:
        # A thread PyTorch has not touched yet has no current context; the driver call would fail.
        current = ctypes.c_void_p()
        self.driver.check("cuCtxGetCurrent", ctypes.byref(current))
        if current.value != self.context:
            self.driver.check("cuCtxSetCurrent", ctypes.c_void_p(self.context))


def stamp_kernel_or_reason() -> tuple[Optional[StampKernel], str]:
    """The stamp kernel, or None and why not (the caller falls back to torch.cuda._sleep and
    CUDA events, and says so)."""
    try:
        return StampKernel(), "globaltimer stamp kernel (PTX)"
    except (DriverError, OSError) as e:
        return None, f"torch.cuda._sleep + CUDA events (stamp kernel unavailable: {e})"


# --- the probe's child ---------------------------------------------------------------------------

def open_ipc_event(hex_handle: str) -> str:
    """Opens an interprocess event handle in this process; what the driver returned, and, when
    it opened, what querying the event returned."""
    raw = bytes.fromhex(hex_handle)
    if len(raw) != ctypes.sizeof(CUipcEventHandle):
        raise ValueError(f"an event handle is {ctypes.sizeof(CUipcEventHandle)} bytes, "
                         f"not {len(raw)}")
    driver = Driver()
    driver.primary_context()
    handle = CUipcEventHandle.from_buffer_copy(raw)
    event = ctypes.c_void_p()
    _, name = driver.call("cuIpcOpenEventHandle", ctypes.byref(event), handle)
    if not event.value:
        return f"cuIpcOpenEventHandle -> {name}"
    _, query = driver.call("cuEventQuery", event)
    driver.call("cuEventDestroy", event)
    return f"cuIpcOpenEventHandle -> {name}; cuEventQuery on it -> {query}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "open-ipc-event":
        try:
            print(open_ipc_event(argv[1]), flush=True)
        except (DriverError, ValueError) as e:
            print(f"set-up failed: {e}", flush=True)
            return 1
        return 0
    print("usage: cuda_driver.py open-ipc-event HEX", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
