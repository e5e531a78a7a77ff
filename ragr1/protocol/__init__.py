"""The text protocol that the policy, the trainer and the reward all speak.

- ``prompts``: the instructions of each search mode and the prompt as chat-template token ids;
- ``grammar``: the tags, the stop strings, one turn's action, and a whole response parsed into segments
  (from who-wrote-what spans, so that inserted text is never read as the model's action);
- ``information``: the ``<information>`` block RAG-R1 inserts after a search, with its per-query token
  budget;
- ``trajectories``: the pieces the format-learning (SFT) trajectories are made of.

Every service imports this package, so a change here reaches all of them; this package imports no
service. A service reaches another only through that one's ``client.py`` (the trainer the policy's, the
policy the retriever's and the reward's), never its internals.
"""
