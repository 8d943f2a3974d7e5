"""Small models used by the tests, benchmarks and examples (a model is not a parallelism: they
live here, and use the layers of :mod:`commlib.parallel`)."""
