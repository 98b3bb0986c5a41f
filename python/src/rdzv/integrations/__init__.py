"""Integrations that report steps and mark a checkpoint complete the moment a
framework finished writing it. Each module imports its framework only when
it is itself imported: import rdzv.integrations.transformers,
rdzv.integrations.lightning, rdzv.integrations.deepspeed or
rdzv.integrations.dcp as needed."""
