"""One measurement: runner, phase loop, protocol, validity and the run summary."""
