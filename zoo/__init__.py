"""The zoo: real third-party RMSNorm implementations, wrapped as the docs tell users to.

Each module in ``zoo/entries/`` exposes ``ENTRIES``, a list of :class:`zoo.entry.ZooEntry`. The
zoo is not part of the installed package: it lives beside the tests, which run every entry through
``rmsref.validate`` and compare the verdict with the one its author derived from reading the
implementation's source.
"""
