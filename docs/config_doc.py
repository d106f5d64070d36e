"""Write docs/configuration.md from the settings' declarations.

Run it after adding or changing a setting (``.venv/bin/python docs/config_doc.py``);
tests/test_docs.py fails while the file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from listener_router import configuration_reference  # noqa: E402

if __name__ == "__main__":
    (HERE / "configuration.md").write_text(configuration_reference(), encoding="utf-8")
    print(f"wrote {HERE / 'configuration.md'}")
