"""ParSer's Hydra configs, shipped as this package's data so an installed ParSer finds them.

The YAML files are the content; this file makes the folder a package that `importlib.resources`
can locate (`parser.base.resources.config_dir()`), in a checkout, an editable install and a wheel
alike. See docs/architecture.md ("Configs").
"""

# `configs` is a common name: parser.base.resources checks this, so another project's `configs` package
# earlier on the path fails with a clear error instead of feeding Hydra the wrong tree.
OWNER = "parser-agents"
