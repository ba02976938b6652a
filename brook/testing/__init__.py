"""Parts for testing applications built on Brook (and Brook itself), shipped with it."""
