"""The text the tiktoken gate encodes with both encoders before it lets tiktoken encode a job.

The gate proves the two agree from the serialized tokenizer; what the proof leaves to fact (the
regex engines' Unicode tables, HF's and Python's NFC) is checked on this text, in the main
process, and again per unit by the canary.
"""

from __future__ import annotations

# A fixed text that exercises what differs between regex engines and BPE orders: scripts,
# combining marks, unusual whitespace, digit runs, contractions, code. The gate encodes it (and
# every added token inside text) with both encoders and refuses on any difference.
PROBE_TEXT = (
    "Hello world! It's we've they'll I'd DON'T   spaces\t\ttabs\n\n\nnewlines\r\n"
    "1234567890 3.14159 1,000,000 x=42; y += 0x1F\n"
    "def f(a, b):\n    return a**2 + b  # comment\n\t\tif x:\n        pass\n"
    "Ünïcödé naïve café résumé Straße ﬁ ǅ İ ı\u0301 e\u0301 a\u0308\n"
    "Привет мир Ελληνικά עברית العربية हिन्दी ภาษาไทย 日本語のテキスト 中文字符 한국어\n"
    "emoji 😀👍🏽👨‍👩‍👧 🇩🇪 ★☆ ✓ → ∑∫√ ½ ² ①\n"
    "nbsp\u00a0here\u2003em\u3000ideo\u200bzw\u2028ls\u2029ps\x0bvt\x0cff\x1cfs\x85nel\n"
    "AMAMAMA ababab aaaaaaaaaaaaaaaaaaaaaaaa ............ ------------ ============\n"
    "    \n  \n\n \t \n" + " " * 17 + "end" + "\n" * 5 + "!!!???" + "\u0000\u0001\u007f\n"
    # What NFC changes (decomposed forms, singletons, mark order, Hangul jamo) and must not
    # (compatibility characters), for tokenizers with an NFC normalizer.
    "e\u0301 A\u030a \u212b \u212a \u2126 \u037e \u1fef a\u0323\u0302 a\u0302\u0323 o\u0308\u0304 "
    "\u1100\u1161\u11a8 \uac00\u11a8 \u0915\u093c \u0958 \u05e9\u05c1 <\u0338 >\u0338 =\u0338 "
    "ﬁ ① ㎏ ｆｕｌｌ ＡＢ ™ ℌ \u0301\u0301 \u0338 \U00011935\U00011930"
)


def probe_texts(specials: dict[str, int]) -> list[str]:
    """PROBE_TEXT, and every added token inside text and at the edges."""
    texts = [PROBE_TEXT, PROBE_TEXT.upper(), PROBE_TEXT[::-1]]
    for content in sorted(specials):
        # U+0338 and U+0301 around a token: NFC across its edges would join them to it.
        texts.append(
            f"a{content}b {content} {content}{content}\n{content} é{content}\u0338 "
            f"e\u0301{content}\u0301"
        )
    return texts
