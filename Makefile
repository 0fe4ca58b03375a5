.PHONY: setup demo test test-fast
setup:
	scripts/setup.sh
demo:
	scripts/demo.sh
# Everything: lint, types, import contracts and every test (the README's command and CI's).
test:
	scripts/test.sh
# The edit-test loop: the same checks, without the tests marked slow (end-to-end runs).
test-fast:
	scripts/test.sh -m "not slow"
