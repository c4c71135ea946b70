"""Fine-tuning records to token masks: ``record -> Conversation -> Rendered -> (ids, mask)``.

- ``config``: the ``--sft CONFIG.yaml`` settings and their command-line overrides.
- ``formats`` / ``jq_patterns``: a raw record to a :class:`Conversation` (or a Reject).
- ``templates`` / ``render``: a Conversation to one string with its trained character spans.
- ``encode``: that string encoded once with offsets into token ids and a 0/1 mask.
"""
