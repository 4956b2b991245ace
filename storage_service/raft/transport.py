"""pysyncobj's TCP connection, with a wire that costs O(bytes) instead of O(bytes^2).

pysyncobj 0.3.17 frames every raft message as ``zlib.compress(pickle(msg), 3)``
with pickle protocol 2 (``bytes`` become latin-1 strings), and keeps its read
and write buffers as ``bytes`` that it grows with ``+=`` and trims by slicing:
each is a full copy, so a 1 MiB append arriving in 64 KiB reads is copied ~16
times. Profiling a 3-node group at ~15k 1 KiB messages/s showed over half of
the nodes' CPU in those lines.

``FastTcpConnection`` keeps both buffers as ``bytearray`` (amortised appends,
in-place trims), pickles with the highest protocol and sends frames
uncompressed: ``u32 length | pickle``. It also asks the poller for a WRITE
event when a send could not finish, where pysyncobj waited for the next send
to push the rest. All nodes of a cluster run this code, so the frame change
needs no negotiation. Encryption (pysyncobj's ``password``) is not supported.
"""
from __future__ import annotations

import pickle
import socket
import struct

from pysyncobj.poller import POLL_EVENT_TYPE

from . import _pysyncobj
from ._pysyncobj import CONNECTED, Connection

__all__ = ["FastTcpConnection", "install"]

_LEN = struct.Struct("<I")
_AGAIN = (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK)
BIG_FRAME = 256 << 10      # a frame this big is received into a buffer of its own (on_readable)
_BAD = object()            # a frame that is not a message (``_decoded``)
_SCAN_FRAMES = 256         # whole frames looked past for a big one behind them (_big_frame)
KEEP_BIG = 16 << 20        # the largest frame received that way; its buffer is kept


class FastTcpConnection(Connection):

    def send(self, message):
        if self.encryptor:
            raise RuntimeError("FastTcpConnection does not support pysyncobj encryption")
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        _, wbuf = self.buffers()
        if not wbuf and self.state == CONNECTED:
            # Nothing queued: hand the frame to the kernel straight from the
            # pickle, and queue only what it did not take (an append entry is
            # ~100 KiB+; copying it into the buffer first was a visible cost).
            # The read-timeout check pysyncobj makes on every send stays.
            self.check_timeout()
            if self.state != CONNECTED:
                # Timed out and closed. pysyncobj's disconnect callback may
                # already have opened a new socket (state CONNECTING): this
                # message must not go out ahead of that socket's handshake
                # (the node's address), or the peer reads a dict where it
                # expects an address and fails ("unhashable type: 'dict'").
                return
            head = _LEN.pack(len(data))
            try:
                sent = self.sock.sendmsg((head, data))
            except socket.error as e:
                if e.errno not in _AGAIN:
                    self.disconnect()
                    return
                sent = 0
            if sent < len(head):
                wbuf += head[sent:]
                wbuf += data
            elif sent < len(head) + len(data):
                wbuf += memoryview(data)[sent - len(head):]
        else:
            wbuf += _LEN.pack(len(data))
            wbuf += data
            self.try_send_buffer()
        if wbuf and self.state == CONNECTED:
            self.watch(POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)

    def on_send_ready(self):
        _, wbuf = self.buffers()
        if not wbuf:
            return False
        try:
            res = self.sock.send(wbuf)
        except socket.error as e:
            if e.errno not in _AGAIN:
                self.disconnect()
            return False
        if res <= 0:
            if res < 0:
                self.disconnect()
            return False
        del wbuf[:res]
        return True

    def _recv_chunk(self) -> memoryview:
        """One receive buffer per connection, not a fresh 1 MiB per recv."""
        chunk = getattr(self, "_chunk", None)
        if chunk is None:
            chunk = self._chunk = memoryview(bytearray(self.recv_buffer_size))
        return chunk

    def on_readable(self):
        rbuf, _ = self.buffers()
        big = self._big_frame(rbuf)
        if big is not None and big[2] == len(big[1]):
            return False                 # whole: next_message takes it (the poll says readable again)
        chunk = big[1][big[2]:] if big is not None else self._recv_chunk()
        try:
            n = self.sock.recv_into(chunk)
        except socket.error as e:
            if e.errno not in _AGAIN:
                self.disconnect()
            return False
        if not n:
            self.disconnect()
            return False
        if big is not None:
            big[2] += n
        else:
            rbuf += chunk[:n]
            if n == len(chunk):              # more waiting: maybe a big frame on its way
                self._big_frame(rbuf)
        return True

    def _big_frame(self, rbuf: bytearray) -> list | None:
        """The frame being received straight into its own buffer: ``[rbuf, body view,
        bytes received]``; begun here when the last frame ``rbuf`` holds is incomplete
        and of ``BIG_FRAME`` to ``KEEP_BIG`` bytes (it leaves ``rbuf``: the frames before it are
        taken first, then it, ``next_message``). A raft append of many produce batches
        is megabytes; gathered in the read buffer it was copied on every growth of the
        buffer: ~4x the read CPU per message with 48 producers' entries as with 12's
        (issue 39.3). None otherwise, and after the connection's buffers were reset (a
        new connection)."""
        big = getattr(self, "_big", None)
        if big is not None and big[0] is rbuf:
            return big
        self._big = None
        pos, end = 0, len(rbuf)
        for _ in range(_SCAN_FRAMES):
            if end - pos < _LEN.size:
                return None
            n = _LEN.unpack_from(rbuf, pos)[0]
            if pos + _LEN.size + n <= end:
                pos += _LEN.size + n             # a whole frame: taken from rbuf
                continue
            if not BIG_FRAME <= n <= KEEP_BIG:
                # (Bigger frames are rare and gather in rbuf as before: a length read from
                # a stranger's bytes, an HTTP request's "GET " is 542 MB, allocates nothing.)
                return None
            have = end - pos - _LEN.size
            store = getattr(self, "_big_store", None)
            if store is None or len(store) < n:
                # Kept for the next big frame: a fresh buffer of megabytes a frame is
                # fresh pages to fault in on every frame.
                store = self._big_store = bytearray(n)
            body = memoryview(store)[:n]
            body[:have] = rbuf[pos + _LEN.size:]
            del rbuf[pos:]
            self._big = [rbuf, body, have]
            return self._big
        return None

    def next_message(self):
        rbuf, _ = self.buffers()
        big = getattr(self, "_big", None)
        if big is not None and big[0] is rbuf and not rbuf:      # the frames before it taken
            if big[2] < len(big[1]):
                return None
            self._big = None
            with big[1] as body:             # released: the buffer is reused for the next one
                message = self._decoded(body)
            return None if message is _BAD else message
        if len(rbuf) < _LEN.size:
            return None
        n = _LEN.unpack_from(rbuf, 0)[0]
        if len(rbuf) - _LEN.size < n:
            return None
        with memoryview(rbuf) as mv:
            message = self._decoded(mv[_LEN.size:_LEN.size + n])
        if message is _BAD:
            return None
        del rbuf[:_LEN.size + n]
        return message

    def _decoded(self, body):
        """A frame's message; ``_BAD`` (and the connection dropped) if it is not one."""
        try:
            message = pickle.loads(body)
        except Exception:
            self.disconnect()
            return _BAD
        if self.recvRandKey:
            rand_key, message = message
            if rand_key != self.recvRandKey:
                self.disconnect()
                return _BAD
        return message


def install() -> None:
    """Make pysyncobj's transport and server create FastTcpConnection (idempotent).

    Also raise pysyncobj's own pickle protocol (used for raft commands and
    journal entries) from 2 to the highest: under protocol 2 every ``bytes``
    payload round-trips through a latin-1 ``str`` (``_codecs.encode``).
    """
    _pysyncobj.install(FastTcpConnection)
