"""The secrets test's third group, declared the YAML way (``defs.yaml``) and loaded into its code location."""
