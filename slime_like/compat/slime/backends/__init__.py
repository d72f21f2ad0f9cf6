"""slime.backends: the parts of slime's trainer API that custom losses use."""
