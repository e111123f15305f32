"""The wait queue: its order (``order.py``), reading it (``view.py``), waiting in it
(``wait.py``: a waiter's entries in ``ticket.py``, the gate of its take in ``turn.py``)
and riding out a store outage while waiting (``faults.py``).
"""

__all__: list[str] = []
