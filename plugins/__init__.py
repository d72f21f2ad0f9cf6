"""Extension points of slime-like and their shipped examples."""
