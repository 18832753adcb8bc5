"""What a fold reports, and what folding some inputs would remove."""
