"""One GPU pool, two clouds: cross-audit and safe role changes (pure)."""
