"""Ground floor: pure functions over model text (chat format, chunking, lenient JSON, the lead's
actions, answer matching, the authors' release facts). No I/O, no model, nothing else of `parser`
(tests/test_import_graph_on_cpu.py `FLOORS`)."""
