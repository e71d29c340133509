"""Policy: which kind (dedicated, VF, CU) fits each workload, and where."""
