# Builds liburingtier, the tier's C ABI (capi/), and the Python package around it (python/).
#
#   make python        build the library into python/uringtier/ and make the package importable
#                      by $(PYTHON) (a .pth file in its user site-packages pointing at python/)
#   make capi          build/liburingtier.so and build/uringtier.h, for C programs
#   make test-python   the Python tests and the C test (as `go test ./capi/` runs them)

GO ?= go
PYTHON ?= /usr/bin/python3

.PHONY: python capi test-python FORCE

python/uringtier/liburingtier.so: FORCE
	$(GO) build -buildmode=c-shared -o $@ ./capi
	rm -f python/uringtier/liburingtier.h

python: python/uringtier/liburingtier.so
	@site=$$($(PYTHON) -c 'import site; print(site.getusersitepackages())') && \
	mkdir -p "$$site" && echo "$(CURDIR)/python" > "$$site/uringtier.pth" && \
	echo "uringtier: importable by $(PYTHON) through $$site/uringtier.pth"
	@cd / && $(PYTHON) -c 'import uringtier; print("uringtier:", uringtier.__file__)'

capi: FORCE
	$(GO) build -buildmode=c-shared -o build/liburingtier.so ./capi
	cp capi/uringtier.h build/uringtier.h
	rm -f build/liburingtier.h

test-python:
	URINGTIER_PYTHON=$(PYTHON) $(GO) test -count=1 -v -run 'TestPython|TestC' ./capi/

FORCE:
