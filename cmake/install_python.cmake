# The Python package (pyproject.toml, scikit-build-core: install.components = python): the
# shared library alone, as syncbn/lib/libsyncbn.so inside the wheel (one file, not the
# soname's symlinks, which a wheel would turn into copies); python/syncbn loads it by path
# with ctypes. Nothing of the C install (cmake/install.cmake) goes into the wheel, and these
# rules stand apart from it: SYNCBN_INSTALL=OFF leaves the C install out, not the wheel's
# library. EXCLUDE_FROM_ALL keeps them out of a plain `cmake --install`.
install(FILES $<TARGET_FILE:syncbn> DESTINATION syncbn/lib RENAME libsyncbn.so
  COMPONENT python EXCLUDE_FROM_ALL)
# and syncbn.h, which syncbn.torch's C++ operators (python/syncbn/csrc, compiled on first
# use against the installed PyTorch: python/syncbn/_native.py) include
install(FILES ${PROJECT_SOURCE_DIR}/include/syncbn.h DESTINATION syncbn/include
  COMPONENT python EXCLUDE_FROM_ALL)
