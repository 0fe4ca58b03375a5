"""Load generation: the generators that drive a target on a load mode's schedule
(`optlab.config.modes`).

Import the generator from :mod:`optlab.load.generator`; this package stays import-light.
"""
