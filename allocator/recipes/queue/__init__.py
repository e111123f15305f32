"""The wait queue: its order (``order.py``), reading it (``view.py``), waiting in it
(``wait.py``) and riding out a store outage while waiting (``faults.py``).
"""

__all__: list[str] = []
