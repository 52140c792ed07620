"""``python -m bridge.config``: print the configuration reference (docs/configuration.md)."""

from __future__ import annotations

import sys

from bridge.config.reference import reference_markdown

sys.stdout.write(reference_markdown())
