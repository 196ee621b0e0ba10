package images

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrYAML is wrapped by every error of DecodeYAML.
var ErrYAML = errors.New("yaml")

// DecodeYAML decodes the documents of a YAML stream written in the
// subset the manifests here use, into the values encoding/json would
// give for the same data: map[string]any, []any, string, bool, int64,
// float64 and nil. Empty documents are left out.
//
// The subset: documents separated by "---" lines; block mappings and
// block sequences (also "- key: value" items, and a sequence at its
// key's indentation); literal block scalars ("|", "|-", "|+"); plain,
// single- and double-quoted scalars; flow sequences that are JSON
// arrays; "#" comments. Plain scalars resolve as YAML 1.2's core schema
// does, except that what YAML 1.1 would read differently (yes, no, on,
// off, numbers with a leading 0) is refused, so that every reader of a
// manifest sees the same value. Anything else — tabs for indentation,
// anchors, aliases, tags, flow mappings but {}, folded scalars,
// multi-line plain scalars, duplicate keys — is an error naming its line.
func DecodeYAML(data []byte) ([]any, error) {
	var docs []any
	var cur []rawLine
	flush := func() error {
		p := &yamlParser{lines: cur}
		v, err := p.document()
		if err != nil {
			return err
		}
		if v != nil {
			docs = append(docs, v)
		}
		cur = nil
		return nil
	}
	for i, l := range strings.Split(string(data), "\n") {
		l = strings.TrimRight(l, " \r")
		if l == "---" || strings.HasPrefix(l, "--- #") {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		if strings.HasPrefix(l, "---") || l == "..." {
			return nil, fmt.Errorf("%w: line %d: %q: only a bare --- separates documents", ErrYAML, i+1, l)
		}
		ind := len(l) - len(strings.TrimLeft(l, " "))
		if strings.HasPrefix(l[ind:], "\t") {
			return nil, fmt.Errorf("%w: line %d: a tab in the indentation", ErrYAML, i+1)
		}
		cur = append(cur, rawLine{num: i + 1, indent: ind, text: l[ind:]})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

// rawLine is one line of a document: its number, indentation and text
// after the indentation.
type rawLine struct {
	num, indent int
	text        string
}

type yamlParser struct {
	lines []rawLine
	pos   int
}

func (p *yamlParser) errorf(l rawLine, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrYAML, l.num, fmt.Sprintf(format, args...))
}

// isContent reports whether a line carries structure (is not blank or a
// comment).
func isContent(l rawLine) bool { return l.text != "" && !strings.HasPrefix(l.text, "#") }

// peek returns the next content line, skipping blank and comment lines.
func (p *yamlParser) peek() (rawLine, bool) {
	for p.pos < len(p.lines) && !isContent(p.lines[p.pos]) {
		p.pos++
	}
	if p.pos == len(p.lines) {
		return rawLine{}, false
	}
	return p.lines[p.pos], true
}

func (p *yamlParser) document() (any, error) {
	l, ok := p.peek()
	if !ok {
		return nil, nil
	}
	if l.indent != 0 {
		return nil, p.errorf(l, "a document's top level must not be indented")
	}
	v, err := p.node(0)
	if err != nil {
		return nil, err
	}
	if l, ok := p.peek(); ok {
		return nil, p.errorf(l, "unexpected %q (indentation?)", l.text)
	}
	return v, nil
}

func isItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// node parses the block node whose first content line is the next one,
// indented by indent.
func (p *yamlParser) node(indent int) (any, error) {
	l, _ := p.peek()
	if isItem(l.text) {
		return p.sequence(indent)
	}
	return p.mapping(indent)
}

// nested parses the value of a key or item whose line ended after the
// indicator: a block more indented than parent, a sequence at the key's
// own indentation (when allowSeq), or nothing (null).
func (p *yamlParser) nested(parent int, allowSeq bool) (any, error) {
	l, ok := p.peek()
	switch {
	case !ok:
		return nil, nil
	case l.indent > parent:
		return p.node(l.indent)
	case l.indent == parent && allowSeq && isItem(l.text):
		return p.sequence(parent)
	}
	return nil, nil
}

var keyRE = regexp.MustCompile(`^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s"'#&*!|>%@` + "`" + `{}\[\],?-][^:#]*?|-[^\s:#][^:#]*?)\s*:(?:\s|$)`)

func (p *yamlParser) mapping(indent int) (any, error) {
	m := map[string]any{}
	for {
		l, ok := p.peek()
		if !ok || l.indent < indent {
			return m, nil
		}
		if l.indent > indent {
			return nil, p.errorf(l, "unexpected indentation")
		}
		if isItem(l.text) {
			return nil, p.errorf(l, "a sequence item where a mapping key is expected")
		}
		loc := keyRE.FindStringSubmatchIndex(l.text)
		if loc == nil {
			return nil, p.errorf(l, "%q is not \"key: value\"", l.text)
		}
		keyText := strings.TrimSpace(l.text[loc[2]:loc[3]])
		key, err := p.scalarString(l, keyText)
		if err != nil {
			return nil, err
		}
		if _, dup := m[key]; dup {
			return nil, p.errorf(l, "key %q repeated", key)
		}
		rest := stripComment(strings.TrimSpace(l.text[loc[1]:]))
		p.pos++
		v, err := p.value(l, indent, rest, true)
		if err != nil {
			return nil, err
		}
		m[key] = v
	}
}

// value parses what follows a key's colon or an item's dash: rest, the
// line's remainder, and the lines after it.
func (p *yamlParser) value(l rawLine, indent int, rest string, allowSeq bool) (any, error) {
	switch {
	case rest == "":
		return p.nested(indent, allowSeq)
	case rest == "|" || rest == "|-" || rest == "|+":
		return p.block(l, indent, rest[1:])
	case strings.HasPrefix(rest, ">"):
		return nil, p.errorf(l, "folded scalars (>) are not supported; use |")
	}
	if next, ok := p.peek(); ok && next.indent > indent && !isItem(rest) {
		return nil, p.errorf(next, "a value continued on another line; use one line or a block scalar (|)")
	}
	return p.scalar(l, rest)
}

func (p *yamlParser) sequence(indent int) (any, error) {
	s := []any{}
	for {
		l, ok := p.peek()
		if !ok || l.indent < indent || (l.indent == indent && !isItem(l.text)) {
			return s, nil
		}
		if l.indent > indent {
			return nil, p.errorf(l, "unexpected indentation")
		}
		rest := strings.TrimLeft(l.text[1:], " ")
		if rest == "" || strings.HasPrefix(rest, "#") {
			p.pos++
			v, err := p.nested(indent, false)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
			continue
		}
		if keyRE.MatchString(rest) || isItem(rest) {
			// "- key: value": the item is a block node starting at the
			// column of its text; its line is read again as that node's
			// first.
			col := indent + len(l.text) - len(rest)
			p.lines[p.pos] = rawLine{num: l.num, indent: col, text: rest}
			v, err := p.node(col)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
			continue
		}
		p.pos++
		v, err := p.value(l, indent, stripComment(rest), false)
		if err != nil {
			return nil, err
		}
		s = append(s, v)
	}
}

// block reads a literal block scalar of the lines more indented than
// parent; chomp is "" (clip: one final newline), "-" (strip) or "+"
// (keep).
func (p *yamlParser) block(l rawLine, parent int, chomp string) (any, error) {
	var body []string
	ind := -1
	for p.pos < len(p.lines) {
		b := p.lines[p.pos]
		if b.text != "" && b.indent <= parent {
			break
		}
		if b.text != "" && ind < 0 {
			ind = b.indent
		}
		if b.text != "" && b.indent < ind {
			return nil, p.errorf(b, "a block scalar line less indented than its first")
		}
		if b.text == "" {
			body = append(body, "")
		} else {
			body = append(body, strings.Repeat(" ", b.indent-ind)+b.text)
		}
		p.pos++
	}
	if ind < 0 {
		return nil, p.errorf(l, "an empty block scalar")
	}
	text := strings.Join(body, "\n")
	switch chomp {
	case "":
		text = strings.TrimRight(text, "\n") + "\n"
	case "-":
		text = strings.TrimRight(text, "\n")
	case "+":
		text += "\n"
	}
	return text, nil
}

// stripComment removes a " #" comment outside quotes.
func stripComment(s string) string {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			if i == 0 || s[i-1] == ' ' || s[i-1] == '[' || s[i-1] == ',' {
				quote = c
			}
		case c == '#' && i > 0 && (s[i-1] == ' ' || s[i-1] == '\t'):
			return strings.TrimSpace(s[:i])
		}
	}
	return s
}

var (
	intRE   = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)$`)
	floatRE = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)\.[0-9]+([eE][-+]?[0-9]+)?$`)
	yaml11  = regexp.MustCompile(`^(?i:y|n|yes|no|on|off|[-+]?0[0-9_]+|[-+]?0[box][0-9a-f_]+|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+|\.inf|-\.inf|\.nan)$`)
)

// scalar resolves a one-line scalar.
func (p *yamlParser) scalar(l rawLine, s string) (any, error) {
	switch {
	case strings.HasPrefix(s, `"`), strings.HasPrefix(s, `'`):
		return p.scalarString(l, s)
	case strings.HasPrefix(s, "["):
		var v []any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return nil, p.errorf(l, "flow sequence %s: only JSON arrays are supported: %v", s, err)
		}
		for i, e := range v {
			if f, ok := e.(float64); ok && f == float64(int64(f)) {
				v[i] = int64(f)
			}
		}
		return v, nil
	case s == "{}":
		return map[string]any{}, nil
	case strings.ContainsAny(s[:1], "{&*!%@`|>"):
		return nil, p.errorf(l, "%q: flow mappings, anchors, aliases, tags and directives are not supported", s)
	case s == "true" || s == "false":
		return s == "true", nil
	case s == "null" || s == "~":
		return nil, nil
	case intRE.MatchString(s):
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, p.errorf(l, "%s: %v", s, err)
		}
		return n, nil
	case floatRE.MatchString(s):
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, p.errorf(l, "%s: %v", s, err)
		}
		return f, nil
	case yaml11.MatchString(s), strings.EqualFold(s, "true"), strings.EqualFold(s, "false"), strings.EqualFold(s, "null"):
		return nil, p.errorf(l, "%q reads differently in YAML 1.1 and 1.2; quote it", s)
	case strings.Contains(s, ": ") || strings.HasSuffix(s, ":"):
		return nil, p.errorf(l, "%q: a plain scalar with \": \"; quote it", s)
	}
	return s, nil
}

// scalarString resolves a key or a quoted scalar to its string.
func (p *yamlParser) scalarString(l rawLine, s string) (string, error) {
	switch {
	case strings.HasPrefix(s, `"`):
		var v string
		if len(s) < 2 || !strings.HasSuffix(s, `"`) {
			return "", p.errorf(l, "unterminated string %s", s)
		}
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return "", p.errorf(l, "string %s: only JSON escapes are supported: %v", s, err)
		}
		return v, nil
	case strings.HasPrefix(s, `'`):
		if len(s) < 2 || !strings.HasSuffix(s, `'`) {
			return "", p.errorf(l, "unterminated string %s", s)
		}
		inner := s[1 : len(s)-1]
		if strings.Count(inner, "'")%2 != 0 {
			return "", p.errorf(l, "a lone ' in %s", s)
		}
		return strings.ReplaceAll(inner, "''", "'"), nil
	}
	return s, nil
}
