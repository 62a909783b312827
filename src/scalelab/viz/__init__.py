"""Pictures of a model's insides: attention maps and position encodings (scalelab-viz)."""
