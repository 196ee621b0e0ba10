package config

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// lineIndex maps key paths to the line where they first appear in a TOML
// document. Paths name array elements by index, as the messages do:
// "port[1]" is the second [[port]] table (its header line),
// "port[1].impair.egress" a key in it, "port[0].addresses[2]" the third
// element of an array. The toml package keeps key positions to itself, and
// keeps one per key name, not per [[port]] table, so the index is built by
// scanning the text again.
type lineIndex map[string]int

// line returns the line of key, or of its closest enclosing key or table
// that has one, or 0.
func (ix lineIndex) line(key string) int {
	for key != "" {
		if l, ok := ix[key]; ok {
			return l
		}
		key = parentKey(key)
	}
	return 0
}

// parentKey drops the last element of a key path.
func parentKey(key string) string {
	if strings.HasSuffix(key, "]") {
		if i := strings.LastIndexByte(key, '['); i >= 0 {
			return key[:i]
		}
	}
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i]
	}
	return ""
}

// childKey returns the path of key k in the table at parent, quoting k
// unless it is a bare TOML key.
func childKey(parent, k string) string {
	if !isBareKey(k) {
		k = strconv.Quote(k)
	}
	if parent == "" {
		return k
	}
	return parent + "." + k
}

func isBareKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// indexLines scans src, a document the toml package has accepted, and
// records the line of every table header, key and array element. It is a
// scanner, not a validating parser: on text that is not TOML it records
// lines that may be wrong, but it always terminates and never panics.
func indexLines(src string) lineIndex {
	s := &lineScanner{src: src, line: 1, ix: lineIndex{}, arrays: map[string]int{}}
	table := ""
	for s.pos < len(s.src) {
		start := s.pos
		s.skipSpace(true)
		if s.pos >= len(s.src) {
			break
		}
		if s.src[s.pos] == '[' {
			table = s.header()
		} else {
			s.keyValue(table)
		}
		s.skipLine()
		if s.pos == start {
			s.pos++
		}
	}
	return s.ix
}

type lineScanner struct {
	src    string
	pos    int
	line   int
	ix     lineIndex
	arrays map[string]int // arrays of tables: path -> elements so far
}

func (s *lineScanner) record(key string, line int) {
	if _, ok := s.ix[key]; !ok {
		s.ix[key] = line
	}
}

func (s *lineScanner) peek(off int) byte {
	if s.pos+off < len(s.src) {
		return s.src[s.pos+off]
	}
	return 0
}

// rest returns the text from the current position on.
func (s *lineScanner) rest() string {
	if s.pos >= len(s.src) {
		return ""
	}
	return s.src[s.pos:]
}

// advance moves n bytes on, counting newlines.
func (s *lineScanner) advance(n int) {
	rest := s.rest()
	n = min(n, len(rest))
	s.line += strings.Count(rest[:n], "\n")
	s.pos += n
}

// skipSpace skips blanks, and also newlines and comments when multiline.
func (s *lineScanner) skipSpace(multiline bool) {
	for s.pos < len(s.src) {
		switch s.src[s.pos] {
		case ' ', '\t', '\r':
			s.pos++
		case '\n':
			if !multiline {
				return
			}
			s.advance(1)
		case '#':
			if !multiline {
				return
			}
			s.skipLine()
		default:
			return
		}
	}
}

// skipLine skips to the start of the next line.
func (s *lineScanner) skipLine() {
	if i := strings.IndexByte(s.rest(), '\n'); i >= 0 {
		s.advance(i + 1)
	} else {
		s.pos = len(s.src)
	}
}

// header reads "[a.b]" or "[[a.b]]" and returns the table's path.
func (s *lineScanner) header() string {
	line := s.line
	array := s.peek(1) == '['
	if array {
		s.pos += 2
	} else {
		s.pos++
	}
	keys := s.keys()
	cur := ""
	for i, k := range keys {
		cur = childKey(cur, k)
		if array && i == len(keys)-1 {
			n := s.arrays[cur]
			s.arrays[cur] = n + 1
			s.record(cur, line)
			cur = indexKey(cur, n)
		} else if n, ok := s.arrays[cur]; ok {
			cur = indexKey(cur, n-1)
		}
		s.record(cur, line)
	}
	return cur
}

// keyValue reads "a.b = value" in table.
func (s *lineScanner) keyValue(table string) {
	line := s.line
	keys := s.keys()
	if len(keys) == 0 {
		return
	}
	cur := table
	for _, k := range keys {
		cur = childKey(cur, k)
		s.record(cur, line)
	}
	s.skipSpace(false)
	if s.peek(0) == '=' {
		s.pos++
		s.skipSpace(false)
		s.value(cur)
	}
}

// keys reads a dotted key.
func (s *lineScanner) keys() []string {
	var keys []string
	for s.pos < len(s.src) {
		s.skipSpace(false)
		var k string
		switch s.peek(0) {
		case '"':
			k = s.basicString()
		case '\'':
			k = s.literalString()
		default:
			start := s.pos
			for s.pos < len(s.src) && !strings.ContainsRune(" \t\r\n.=[]{},#\"'", rune(s.src[s.pos])) {
				s.pos++
			}
			k = s.src[start:s.pos]
			if k == "" {
				return keys
			}
		}
		keys = append(keys, k)
		s.skipSpace(false)
		if s.peek(0) != '.' {
			return keys
		}
		s.pos++
	}
	return keys
}

// value skips one value, recording the elements of arrays and the keys of
// inline tables under key.
func (s *lineScanner) value(key string) {
	switch s.peek(0) {
	case '"':
		if strings.HasPrefix(s.rest(), `"""`) {
			s.multiline(`"""`, true)
		} else {
			s.basicString()
		}
	case '\'':
		if strings.HasPrefix(s.rest(), `'''`) {
			s.multiline(`'''`, false)
		} else {
			s.literalString()
		}
	case '[':
		s.pos++
		for i := 0; s.pos < len(s.src); {
			s.skipSpace(true)
			switch s.peek(0) {
			case ']':
				s.pos++
				return
			case ',':
				s.pos++
				continue
			case 0:
				if s.pos >= len(s.src) {
					return
				}
			}
			start := s.pos
			elem := indexKey(key, i)
			s.record(elem, s.line)
			s.value(elem)
			i++
			if s.pos == start {
				s.pos++
			}
		}
	case '{':
		s.pos++
		for s.pos < len(s.src) {
			s.skipSpace(true)
			switch s.peek(0) {
			case '}':
				s.pos++
				return
			case ',':
				s.pos++
				continue
			}
			start := s.pos
			s.keyValue(key)
			if s.pos == start {
				s.pos++
			}
		}
	default:
		// A number, boolean or date-time (which may contain a space).
		for s.pos < len(s.src) && !strings.ContainsRune(",]}\n#", rune(s.src[s.pos])) {
			s.pos++
		}
	}
}

// basicString reads a one-line "..." string and returns its value.
func (s *lineScanner) basicString() string {
	s.pos++ // opening quote
	var b strings.Builder
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		switch c {
		case '"':
			s.pos++
			return b.String()
		case '\n':
			return b.String()
		case '\\':
			s.escape(&b)
		default:
			b.WriteByte(c)
			s.pos++
		}
	}
	return b.String()
}

// escape reads the escape sequence at s.pos into b.
func (s *lineScanner) escape(b *strings.Builder) {
	s.pos++ // backslash
	c := s.peek(0)
	s.pos++
	switch c {
	case 'b':
		b.WriteByte('\b')
	case 't':
		b.WriteByte('\t')
	case 'n':
		b.WriteByte('\n')
	case 'f':
		b.WriteByte('\f')
	case 'r':
		b.WriteByte('\r')
	case 'e':
		b.WriteByte(0x1b)
	case '"', '\\':
		b.WriteByte(c)
	case 'x', 'u', 'U':
		n := 8
		switch c {
		case 'x':
			n = 2
		case 'u':
			n = 4
		}
		if s.pos+n > len(s.src) {
			s.pos = len(s.src)
			return
		}
		r, err := strconv.ParseUint(s.src[s.pos:s.pos+n], 16, 32)
		s.pos += n
		if err == nil && r <= utf8.MaxRune {
			b.WriteRune(rune(r))
		}
	case '\n':
		s.line++
	}
}

// literalString reads a one-line '...' string and returns its value.
func (s *lineScanner) literalString() string {
	s.pos++ // opening quote
	start := s.pos
	for s.pos < len(s.src) && s.src[s.pos] != '\'' && s.src[s.pos] != '\n' {
		s.pos++
	}
	v := s.src[start:s.pos]
	if s.peek(0) == '\'' {
		s.pos++
	}
	return v
}

// multiline skips a multi-line string opened by delim, counting its lines.
func (s *lineScanner) multiline(delim string, escapes bool) {
	s.pos += len(delim)
	for s.pos < len(s.src) {
		switch {
		case escapes && s.src[s.pos] == '\\':
			s.advance(2)
		case strings.HasPrefix(s.rest(), delim):
			s.pos += len(delim)
			// Up to two more quotes belong to the content.
			for i := 0; i < 2 && s.peek(0) == delim[0]; i++ {
				s.pos++
			}
			return
		default:
			s.advance(1)
		}
	}
}
