"""The command's inferrer (`specviz watch --`, and the API when nothing was declared and the batch
changed): which sequence each row of each target call holds, read from what the rows attend and
were fed, and what each step gave each sequence. The only place in the watch with heuristics;
where they do not single out one reading, the run is unreadable from there (docs/watch-command.md).

- `follow`: the `Follower` that walks the target calls, and `follow_rows` (the API's use of it);
- `match`: assigning a call's rows to sequences, and breaking ties on the call's own evidence;
- `gains`: what each step gave a sequence, and how sequences end;
- `decoded`: a last step's tokens, read from the outputs the script decoded;
- `followed`: the row views, sequences and open steps it keeps while it walks.
"""
