"""CU and memory sharing of one GPU among several consumers (pure Python)."""
