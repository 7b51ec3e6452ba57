"""ParSer's Hydra configs, shipped as this package's data so an installed ParSer finds them.

The YAML files are the content; this file only makes the folder a package that
`importlib.resources` can locate (`parser.resources.config_dir()`), in a checkout, an editable
install and a wheel alike. See docs/architecture.md ("Configs").
"""
