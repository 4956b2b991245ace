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
        chunk = self._recv_chunk()
        try:
            n = self.sock.recv_into(chunk)
        except socket.error as e:
            if e.errno not in _AGAIN:
                self.disconnect()
            return False
        if not n:
            self.disconnect()
            return False
        rbuf, _ = self.buffers()
        rbuf += chunk[:n]
        return True

    def next_message(self):
        rbuf, _ = self.buffers()
        if len(rbuf) < _LEN.size:
            return None
        n = _LEN.unpack_from(rbuf, 0)[0]
        if len(rbuf) - _LEN.size < n:
            return None
        with memoryview(rbuf) as mv:
            try:
                message = pickle.loads(mv[_LEN.size:_LEN.size + n])
            except Exception:
                self.disconnect()
                return None
        del rbuf[:_LEN.size + n]
        if self.recvRandKey:
            rand_key, message = message
            if rand_key != self.recvRandKey:
                self.disconnect()
                return None
        return message


def install() -> None:
    """Make pysyncobj's transport and server create FastTcpConnection (idempotent).

    Also raise pysyncobj's own pickle protocol (used for raft commands and
    journal entries) from 2 to the highest: under protocol 2 every ``bytes``
    payload round-trips through a latin-1 ``str`` (``_codecs.encode``).
    """
    _pysyncobj.install(FastTcpConnection)
