"""What the operator verbs do, beneath their faces (``bridge/commands/``, ``bridge/console/``):
redrive, resolve, resend, purge, the go/no-go check and its probe, the shadow report."""
