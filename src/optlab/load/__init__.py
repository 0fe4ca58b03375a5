"""Load generation: schedules of intended send times, and the generator that drives a target.

Import the generator from :mod:`optlab.load.generator`; this package stays import-light.
"""
