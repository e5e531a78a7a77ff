"""The text protocol that the policy, the trainer and the reward all speak.

- ``prompts``: the instructions of each search mode and the prompt as chat-template token ids;
- ``grammar``: the tags, the stop strings, one turn's action, and a whole response parsed into segments
  (from who-wrote-what spans, so that inserted text is never read as the model's action);
- ``information``: the ``<information>`` block RAG-R1 inserts after a search, with its per-query token
  budget;
- ``sft``: the pieces the format-learning trajectories are made of.

No service imports another service: each imports this package, so a change here reaches all three.
"""
