"""Console entry points; the only package that parses argv."""
