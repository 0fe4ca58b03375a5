.PHONY: setup demo test test-fast schemas
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
# docs/schemas/ from the models (tests/unit/test_docs.py fails when they are stale).
schemas: setup
	.venv/bin/python scripts/schemas.py
