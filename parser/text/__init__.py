"""Ground floor: pure functions over model text (chat format, chunking, lenient JSON, the lead's
actions, answer matching, the authors' release facts). No I/O, no model, nothing else of `parser`
but `base`."""
