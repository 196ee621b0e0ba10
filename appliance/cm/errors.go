package cm

import "errors"

// Sentinel errors of Parse, ParseCMAHeader and the encoders. Parse wraps
// them with the offending value (errors.Is finds them).
var (
	// ErrLength: a MAD is not MADLen (256) bytes long.
	ErrLength = errors.New("cm: MAD is not 256 bytes")
	// ErrBaseVersion: the MAD's base version is not 1 (IBA 13.4.3).
	ErrBaseVersion = errors.New("cm: unsupported MAD base version")
	// ErrClass: the MAD's management class is not the CM's (0x07).
	ErrClass = errors.New("cm: not a communication management MAD")
	// ErrClassVersion: the CM class version is not 2. A CM answers a
	// REQ of another version with REJ reason RejInvalidClassVersion.
	ErrClassVersion = errors.New("cm: unsupported CM class version")
	// ErrAttribute: an attribute ID the CM class does not define.
	ErrAttribute = errors.New("cm: unknown CM attribute")
	// ErrMethod: a method the attribute is not sent with (connection
	// messages go with Send, ClassPortInfo with Get, Set or GetResp).
	ErrMethod = errors.New("cm: method not used with this attribute")
	// ErrBufferTooSmall: Encode was given fewer than MADLen bytes, or a
	// CMA header encoder fewer than CMAHeaderLen.
	ErrBufferTooSmall = errors.New("cm: buffer too small")
	// ErrCMAHeaderLength: private data too short for a CMA header.
	ErrCMAHeaderLength = errors.New("cm: private data too short for a CMA header")
	// ErrCMAVersion: a CMA header whose cma_version is not 0.
	ErrCMAVersion = errors.New("cm: unsupported CMA header version")
	// ErrCMAIPVersion: a CMA header whose IP version is neither 4 nor 6.
	ErrCMAIPVersion = errors.New("cm: CMA header IP version neither 4 nor 6")
	// ErrCMAAddress: CMA header addresses that are missing or of two
	// different IP versions.
	ErrCMAAddress = errors.New("cm: CMA header addresses invalid or of mixed IP versions")
)
