# cmake -DDIR=<folder> -P check_includes.cmake: fails naming every #include under DIR whose path
# holds "..". Such a path could reach a higher layer's folder from a source's own folder, or from
# a layer's include root (".." after one of its symlinks leads into src/), so the rule in
# src/CMakeLists.txt holds only where no include uses it.
file(GLOB_RECURSE files ${DIR}/*.cpp ${DIR}/*.hpp ${DIR}/*.h ${DIR}/*.c)
set(found "")
foreach(file IN LISTS files)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"][^\">]*\\.\\.")
  foreach(line IN LISTS lines)
    string(APPEND found "\n  ${file}: ${line}")
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "#include with \"..\" (name the folder from src/ instead):${found}")
endif()
list(LENGTH files count)
message(STATUS "${count} files, no #include with \"..\"")
