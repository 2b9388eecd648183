"""The ``naiad`` command line: the application shell on top of every package.

``naiad serve|gateway|worker|scaler|deploy|status|k8s render`` (:mod:`naiad_cli.commands`)
builds :class:`naiad.settings.Settings` from flags and ``NAIAD_*`` variables and starts the
parts from :mod:`gateway`, :mod:`workers`, :mod:`repository_store` and :mod:`infra`. Nothing
imports this package: the kernel (:mod:`naiad`) sits at the bottom (``tests/test_layers.py``).
"""
