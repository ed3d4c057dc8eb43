"""The `moe-dag` command line, the summary it prints and how query results are written."""
