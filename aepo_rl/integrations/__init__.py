"""Adapters that bring AEPO into other trainers: the verl plugin (``verl/``) and the TRL adapter (``trl/``)."""
