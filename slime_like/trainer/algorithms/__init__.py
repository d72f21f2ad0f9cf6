"""Loss and advantage math, one module per algorithm."""
