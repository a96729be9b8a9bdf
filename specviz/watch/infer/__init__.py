"""The command's inferrer (`specviz watch --`, and the API when nothing was declared and the batch
changed): which sequence each row of each target call holds, and what each step gave it. The only
place in the watch with heuristics; where they single out no one reading, reading stops (docs/watch-command.md)."""
