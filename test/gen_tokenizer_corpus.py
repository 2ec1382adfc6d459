#!/usr/bin/env python3
"""gen_tokenizer_corpus.py — writes the corpus of the tokenizer parity test (test/test_data.sh) into
OUT_DIR as JSONL (field "text"), one document per line:
  * hand-written documents: English, code, other scripts, emoji (ZWJ sequences, skin tones, flags,
    keycaps), whitespace runs (trailing spaces and newlines, tabs, CRLF, Unicode spaces), numbers
    of many lengths and scripts, contractions in every case, the special tokens' text;
  * long pieces (a 3000-letter word, 2000 spaces, 1500 punctuation marks, 5000 digits) that take
    the tokenizer's heap path for long pieces;
  * seeded random "soup" documents mixing all of the above with random assigned code points of the
    whole Unicode range (assigned in Python's Unicode 14 tables, so that the test does not depend
    on the exact Unicode version of node, which the reference uses).
  gen_tokenizer_corpus.py OUT_DIR [SOUP_DOCS]
"""
import json, os, random, sys, unicodedata

HAND = [
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere; isn't it?\n",
    "Fellow-Citizens of the Senate and House of Representatives:   In meeting you again I feel much satisfaction.  \n\n\n",
    "don't DON'T Don'T I'm I'M i'M you're YOU'RE You'Re yOu'rE we've WE'VE We'Ve he'll HE'LL He'Ll hE'lL "
    "she'd SHE'D it's IT'S It'S 'tis 'Twas rock 'n' roll ’s it’s O'Neil 'sa 'S 'T 'RE 'VE 'M 'LL 'D ''s '' ' 's\n",
    "int main(int argc, char** argv) {\n    for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n\treturn 0;\n}\n",
    "def f(x):\r\n    return {'a': [1, 2, 3], \"b\": None}  # comment\r\n\r\n\tif x:\n\t\tpass\n",
    '{"key": "value", "n": -12.5e+3, "list": [true, false, null], "nested": {"x": "y"}}',
    "<html><body class=\"main\">&nbsp;&lt;tag&gt;</body></html>\n$ ls -la | grep '^d' && echo $((1+2)) >> /tmp/x.log",
    "中文文本测试：你好，世界！我们今天学习分词器。日本語のテキストです。한국어 텍스트입니다.",
    "مرحبا بالعالم! هذا نص عربي للاختبار. الأرقام: ٠١٢٣٤٥٦٧٨٩ و ۱۲۳",
    "Привет, мир! Это тест на русском языке. Ёлки-палки, 2024 год. Ελληνικά: Γειά σου Κόσμε!",
    "हिन्दी में परीक्षण। नमस्ते दुनिया! संख्याएँ: १२३४५ ६७८९०। ภาษาไทย สวัสดีครับ עברית שלום עולם",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 👩🏾‍💻 🏳️‍🌈 🇺🇸🇫🇷🇯🇵 1️⃣ #️⃣ ❤️ ✨🎉 🧑‍🤝‍🧑 text😀text 😀 😀  😀\n",
    "   leading spaces and trailing spaces     \n  \n\t\t\n\n\n\n     \r\n\r\n  x\u00a0\u00a0y\u3000z\u2003\u2003w\u2028v\u2029u\u205ft\ufeffs\u200bq\u0085p\u180em \t \n",
    "numbers: 0 1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159 -42 +7 1,000,000 1e-9 0x1F 0b1010 "
    "2024-05-20 12:30:45 $1.99 €2,50 ½ ¼ ² ³ Ⅻ ⅷ ① ⑳ 五 百 ١٢٣ 𝟘𝟙𝟚 x²+y²=z²",
    "special tokens as text: <|endoftext|> <|fim_prefix|>a<|fim_middle|>b<|fim_suffix|> <|endofprompt|> "
    "<|pad|><|im_start|>user\nhi<|im_end|> <|notspecial|> <| <|endoftext| <|endoftext|><|endoftext|>",
    "Mixed: naïve café résumé Zoë façade coöperate ﬁ ﬂ Å Å (composed vs decomposed) ǅ ǈ ß ẞ İ ı ſ K Ω",
    "Punctuation!!! ??? ... --- *** ((())) [[]] {{}} <<<>>> \"\"\"''' ``` ~~~ ^^^ ||| \\\\ /// @@@ ### %%%\n...\r\n!!!\n\n",
    "a\nb\r\nc\rd\n\ne\r\n\r\nf \n g \r\n h\t\ni",
    "x",
    "",
    " ",
    "\n",
    "   ",
    "word\n",
    "tabs\there\t\tand\t\t\tthere\t",
    "ALLCAPS WORDS AND MiXeD CaSe WoRdS camelCaseIdentifier snake_case_identifier kebab-case-id __dunder__",
    "URL: https://www.example.com/path/to/page?query=1&b=two#frag mail: someone@example.org",
]

LONG = [
    "".join(random.Random(1).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3000)),
    " " * 2000 + "x",
    "!?.,;:-" * 215,
    "7" * 5000,
    "\n" * 700 + "  " * 300,
    "ab" * 1500,
    "𝕏" * 800,
]

POOLS = [
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    list("0123456789"),
    [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u200b", "\u000b", "\u000c"],
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL", "'d", "'D", "’s"],
    list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后"),
    list("абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ"),
    list("ابتثجحخدذرزسشصضطظعغفقكلمنهوي"),
    list("कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौ्ंः"),
    ["😀", "👍", "🏽", "\u200d", "\ufe0f", "👨", "👩", "👧", "🇺", "🇸", "❤", "✨", "🎉"],
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|fim_prefix|>"],
]


def assigned(cp):
    if 0xD800 <= cp <= 0xDFFF:
        return False
    return unicodedata.category(chr(cp)) not in ("Cn", "Cs")


def soup(rng, n):
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.15:
            while True:
                cp = rng.randrange(0x20, 0x3134F) if rng.random() < 0.8 else rng.randrange(0x80, 0x3000)
                if assigned(cp):
                    out.append(chr(cp))
                    break
        else:
            pool = rng.choice(POOLS)
            out.extend(rng.choice(pool) for _ in range(rng.randint(1, 8)))
    return "".join(out)


def main():
    out_dir = sys.argv[1]
    n_soup = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(20240520)
    docs = HAND + LONG + [soup(rng, rng.randint(1, 3000)) for _ in range(n_soup)]
    with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": len(d), "text": d}, ensure_ascii=rng.random() < 0.5) + "\n")
    print(f"{len(docs)} documents, {sum(len(d.encode('utf-8')) for d in docs)} bytes")


if __name__ == "__main__":
    main()
