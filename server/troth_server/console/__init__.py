"""`troth console` (in progress): a web console that is a client of the troth API.

Built so far: the pure parts, `_forms` (a form from a promise's JSON Schema and
the value a filled form stands for) and `_views` (the inbox's rows, a
workflow's timeline, refusals in words).
"""
