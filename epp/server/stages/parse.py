"""Parse: the gathered body into an `InferenceRequest` by the path's parser (a large body on the parse thread)."""

from __future__ import annotations

import asyncio

from epp.framework.errors import BadRequest
from epp.framework.parsing import LARGE_BODY_BYTES, NoParser, ParsedRequest, RequestParser, request_path
from epp.framework.types import InferenceRequest
from epp.protocol.openai import build_request
from epp.server.stages.receive import Receive


class Parse(Receive):
    __slots__ = ()

    async def _parse_body(self) -> tuple[ParsedRequest, InferenceRequest, bytes, bool]:
        """The parsed body, the request, the body to forward and whether that is a rewrite."""
        gathered = self._body
        if isinstance(gathered, bytearray) and len(gathered) > self._body_size:
            del gathered[self._body_size :]  # less came than was declared (the rest of the preallocation)
        # The body goes in a box that `_parse` empties: no reference to the gathered bytes stays here meanwhile.
        box, self._body = [gathered], b""
        del gathered
        path = request_path(self.headers)
        try:
            parser = self.s.parsers.resolve(path)
        except NoParser as e:
            raise BadRequest(str(e)) from None
        self._error_format = parser.error_format
        if len(box[0]) >= LARGE_BODY_BYTES:
            # Parsed on the parse thread: on the loop, a 100 MiB prompt stalled every other stream for the whole
            # parse (see LARGE_BODY_BYTES for what still holds the GIL).
            return await asyncio.get_running_loop().run_in_executor(self.s.parse_pool(), self._parse, parser, box)
        return self._parse(parser, box)

    def _parse(
        self, parser: RequestParser, box: list[bytes | bytearray]
    ) -> tuple[ParsedRequest, InferenceRequest, bytes, bool]:
        """Parse the body (taken out of `box`) and build the request. Runs on the parse thread for a large body:
        it touches no shared state."""
        gathered = box.pop()
        # One copy into bytes, the bytearray let go at once: a large body is held one time over while it is parsed.
        raw = gathered if isinstance(gathered, bytes) else bytes(gathered)
        del gathered
        parsed = parser.parse(self.headers, raw)
        request, forward = build_request(self.headers, parsed, raw, self.s.model_rewrites)
        return parsed, request, forward, forward is not raw
