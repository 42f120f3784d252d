"""The seed job's own package (a job laid out as a package, imported from the project tree)."""
