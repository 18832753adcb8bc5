"""The folding trace and its back end: known work evaluated, dynamic work staged."""
