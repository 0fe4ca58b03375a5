"""Measurement primitives: stage timing (stages), latency histograms (histogram), the sample
collector (log) and resource sampling (resources).

Import the submodules directly: `import optlab` pulls in `stages` for user target code, and
must not drag numpy, hdrh or NVML along with it.
"""
