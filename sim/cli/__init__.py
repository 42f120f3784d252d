"""The entry points a person uses: the `sim` command and its views (logs, status, doctor)."""
