"""Hydra's config folder, shipped as a package so that an installed copy (a wheel) has it.

``conf`` is a regular package with its YAML files as package data (pyproject.toml), installed
next to ``launch``: ``@hydra.main(config_path="../conf")`` then finds it both ways Hydra resolves
that path. Run as a module (``python -m launch.train``) Hydra takes it relative to the file,
``launch/../conf``; called as an imported function (the ``avspo-*`` console scripts) it takes it
relative to the module, ``pkg://conf``, which needs ``conf`` importable. ``launch.submit``
composes from the folder ``ROOT / "conf"`` beside ``launch``.
"""
