#!/bin/sh
# Create the fork's topics through nsqlookupd and wait until every one is writable.
#
#   TOPICS="orders:4:2:ordered events:2:2 audit:1:2:ext"
#
# Each word is NAME:PARTITIONS:REPLICAS[:OPTION...] with the options `ordered` (orderedmulti=true)
# and `ext` (extend=true).  Like nsq_ha.testing.servers.TopicSpec, every request also carries
# multipart=true, so several partitions may share a node (a 3-node cluster could not otherwise
# host 2 partitions x 2 replicas of a non-ordered topic).
#
# For each topic: POST /topic/create to the lookupd until it answers 200 (right after start-up
# it refuses with "No node is available" or "the cluster is unstable", and a lookupd that is not
# yet the leader refuses too), then poll GET /lookup?topic=T&access=w until every partition is
# listed.  lookupd registers a new topic only at its periodic topic check; re-POSTing the identical
# create (harmless: identical parameters answer 200) more than ~6 s after the previous one triggers
# that check again, so the script does that every REPOST_EVERY seconds while it waits.
#
# Settings (environment):
#   LOOKUPD        lookupd HTTP URL, default http://127.0.0.1:4161 (must be the lookupd leader)
#   TOPICS         the topics, as above (required)
#   TIMEOUT        seconds allowed per topic, default 300
#   REPOST_EVERY   seconds between identical create requests while waiting, default 7
#   DRY_RUN=1      only validate TOPICS and print the URLs it would POST, one a line; no network
#
# Exit status: 0 when all topics are writable, 1 on a refusal or a timeout, 2 on a bad TOPICS.
set -eu
set -f # no globbing: TOPICS is split on blanks and colons

LOOKUPD=${LOOKUPD:-http://127.0.0.1:4161}
LOOKUPD=${LOOKUPD%/}
TIMEOUT=${TIMEOUT:-300}
REPOST_EVERY=${REPOST_EVERY:-7}
DRY_RUN=${DRY_RUN:-0}
ACCEPT='Accept: application/vnd.nsq; version=1.0'

log() {
    printf '%s create-topics: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2
}

die_spec() {
    log "bad TOPICS entry '$1': $2 (expected NAME:PARTITIONS:REPLICAS[:ordered][:ext])"
    exit 2
}

is_uint() {
    case $1 in
        '' | 0?* | *[!0-9]*) return 1 ;;
        *) return 0 ;;
    esac
}

# spec_query SPEC -> prints the /topic/create query string; exits 2 on a malformed SPEC
spec_query() {
    spec=$1
    old_ifs=$IFS
    IFS=:
    # shellcheck disable=SC2086  # splitting the spec on ':' is the point
    set -- $spec
    IFS=$old_ifs
    [ $# -ge 3 ] || die_spec "$spec" "needs at least NAME:PARTITIONS:REPLICAS"
    name=$1 parts=$2 reps=$3
    shift 3
    case $name in
        '' | *[!A-Za-z0-9._-]*) die_spec "$spec" "topic names use only A-Z a-z 0-9 . _ -" ;;
    esac
    [ ${#name} -le 64 ] || die_spec "$spec" "topic name longer than 64 characters"
    is_uint "$parts" && [ "$parts" -ge 1 ] && [ "$parts" -le 254 ] ||
        die_spec "$spec" "PARTITIONS must be 1..254 (no leading zeros)"
    is_uint "$reps" && [ "$reps" -ge 1 ] && [ "$reps" -le 5 ] ||
        die_spec "$spec" "REPLICAS must be 1..5 (no leading zeros)"
    ordered= ext=
    for opt in "$@"; do
        case $opt in
            ordered) ordered='&orderedmulti=true' ;;
            ext) ext='&extend=true' ;;
            *) die_spec "$spec" "unknown option '$opt'" ;;
        esac
    done
    printf 'topic=%s&partition_num=%s&replicator=%s&multipart=true%s%s\n' \
        "$name" "$parts" "$reps" "$ordered" "$ext"
}

# writable_count BODY N -> succeeds when partitions 0..N-1 all appear in an access=w answer
writable_count() {
    _i=0
    # Partition ids are the only numeric keys in the answer: "partitions":{"0":{...},"1":{...}}.
    while [ "$_i" -lt "$2" ]; do
        printf '%s' "$1" | grep -Eq "\"$_i\"[[:space:]]*:[[:space:]]*\\{" || return 1
        _i=$((_i + 1))
    done
    return 0
}

now() {
    date +%s
}

# post_create URL -> prints "<http status> <body>"; status 000 when lookupd is unreachable
post_create() {
    out=$(curl -sS -m 10 --data '' -H "$ACCEPT" -w '\n%{http_code}' "$1" 2>&1) || true
    code=$(printf '%s\n' "$out" | tail -n 1)
    case $code in
        [0-9][0-9][0-9]) ;;
        *) code=000 ;;
    esac
    printf '%s %s\n' "$code" "$(printf '%s\n' "$out" | sed '$d' | tr '\n' ' ')"
}

create_topic() {
    spec=$1 query=$2
    name=${spec%%:*}
    rest=${spec#*:}
    want=${rest%%:*}
    url="$LOOKUPD/topic/create?$query"
    deadline=$(($(now) + TIMEOUT))

    while :; do
        answer=$(post_create "$url")
        code=${answer%% *}
        [ "$code" = 200 ] && break
        case $answer in
            *'already exist'*)
                log "$name exists with other parameters: $answer"
                return 1
                ;;
        esac
        if [ "$(now)" -ge "$deadline" ]; then
            log "$name: /topic/create still refused after ${TIMEOUT}s: $answer"
            return 1
        fi
        log "$name: /topic/create not accepted yet ($answer); retrying"
        sleep 2
    done
    log "$name: created ($want partitions); waiting until lookupd lists them for writing"

    last_post=$(now)
    while :; do
        body=$(curl -sS -m 10 -H "$ACCEPT" \
            "$LOOKUPD/lookup?topic=$name&access=w&metainfo=true" 2>/dev/null) || body=
        if writable_count "$body" "$want"; then
            log "$name: writable"
            return 0
        fi
        if [ "$(now)" -ge "$deadline" ]; then
            log "$name: not writable after ${TIMEOUT}s; last lookup: $body"
            return 1
        fi
        if [ $(($(now) - last_post)) -ge "$REPOST_EVERY" ]; then
            # the identical create makes lookupd run its topic check again
            post_create "$url" >/dev/null
            last_post=$(now)
        fi
        sleep 1
    done
}

main() {
    [ -n "${TOPICS:-}" ] || {
        log "TOPICS is empty: nothing to create (e.g. TOPICS='orders:4:2:ordered events:2:2')"
        exit 2
    }
    # Validate everything before the first request, so a typo creates nothing.
    queries=
    for spec in $TOPICS; do
        q=$(spec_query "$spec") || exit 2
        queries="$queries $spec=$q"
    done
    if [ "$DRY_RUN" = 1 ]; then
        for pair in $queries; do
            printf '%s/topic/create?%s\n' "$LOOKUPD" "${pair#*=}"
        done
        exit 0
    fi
    for pair in $queries; do
        create_topic "${pair%%=*}" "${pair#*=}" || exit 1
    done
    log "all topics writable:$(for pair in $queries; do printf ' %s' "${pair%%:*}"; done)"
}

main "$@"
