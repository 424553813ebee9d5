"""The README's RPC x role table is `domain.access.RPC_ROLES`, as `python -m
troth_server.domain.access` prints it."""

from __future__ import annotations

import re
from pathlib import Path

from troth_server.domain.access import roles_table

README = Path(__file__).parents[2] / "README.md"


def test_the_readme_shows_the_roles_table_as_the_code_has_it() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- roles-table: start.*?-->\n(.*?)<!-- roles-table: end -->", text, re.DOTALL
    )
    assert found, "README.md lacks the roles-table markers"
    assert found.group(1) == roles_table() + "\n", (
        "README.md's RPC x role table is out of date; replace it with the output of "
        "`python -m troth_server.domain.access`"
    )
