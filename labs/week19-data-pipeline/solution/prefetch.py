"""Background prefetch: a thread runs the loader up to `depth` batches ahead of the training loop.

The loader's own position runs ahead too, so the prefetcher keeps, with each batch, the loader's position
after it: the position of the batch the training loop has actually received is the one to checkpoint.
"""
import queue
import threading

_DONE = object()


class Prefetcher:
    def __init__(self, loader, depth: int):
        self.loader, self.depth = loader, depth
        self._state = loader.state_dict()

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._state = state

    def __iter__(self):
        ready = queue.Queue(maxsize=self.depth)  # bounded: at most `depth` batches in memory
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce():
            try:
                for batch in self.loader:
                    if not put((batch, self.loader.state_dict())):
                        return  # the consumer left
                put(_DONE)
            except BaseException as exc:  # handed to the consumer: a failing read must not hang training
                put(exc)

        threading.Thread(target=produce, daemon=True).start()
        try:
            while True:
                item = ready.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, self._state = item
                yield batch
        finally:
            stop.set()
