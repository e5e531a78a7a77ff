#!/usr/bin/env node
// A client of the RAG-R1 retriever in Node.js, built from the contracts in proto/ alone: no code of the
// project, no generated files. @grpc/proto-loader reads retriever.proto (and the common.proto it
// imports) at start; @grpc/grpc-js makes the call.
//
//   npm ci
//   node search.js 127.0.0.1:50051 "who wrote hamlet" "hamlet author"
//   node search.js --top-k 5 --json 127.0.0.1:50051 "who wrote hamlet"
//
// Options: --top-k N (passages per query, default 3), --timeout S (the call's deadline, default 30),
// --json (the reply as JSON on one line), --proto DIR (the proto/ folder; default: the repository's,
// two levels up), and the Python client's settings under the same environment variables:
// --token-file FILE (a file holding the bearer token, when the retriever has auth on;
// RAGR1_CLIENT_TOKEN_FILE), --ca FILE (the server's CA: TLS on; RAGR1_CLIENT_CA_FILE), --cert FILE and
// --key FILE (a client certificate, for mTLS; RAGR1_CLIENT_CERT_FILE, RAGR1_CLIENT_KEY_FILE).
// A failed call prints one line naming the method, the status and the service's message, and exits
// with 1; bad input (an option, a missing file) one line too, and exits with 2.
'use strict';

const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE = 'usage: node search.js [--top-k N] [--timeout S] [--json] [--proto DIR] [--token-file FILE] '
  + '[--ca FILE] [--cert FILE] [--key FILE] ADDRESS QUERY...';

// Bad input: one line and exit 2, never a stack trace.
class UsageError extends Error {}

function parseArgs(argv) {
  const opts = {
    topK: 3,
    timeout: 30,
    json: false,
    proto: path.join(__dirname, '..', '..', 'proto'),
    // The Python client's variables (ragr1/services/common/client.py), so one environment configures both.
    tokenFile: process.env.RAGR1_CLIENT_TOKEN_FILE || '',
    ca: process.env.RAGR1_CLIENT_CA_FILE || '',
    cert: process.env.RAGR1_CLIENT_CERT_FILE || '',
    key: process.env.RAGR1_CLIENT_KEY_FILE || '',
    rest: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--top-k') opts.topK = Number(value());
    else if (arg === '--timeout') opts.timeout = Number(value());
    else if (arg === '--json') opts.json = true;
    else if (arg === '--proto') opts.proto = value();
    else if (arg === '--token-file') opts.tokenFile = value();
    else if (arg === '--ca') opts.ca = value();
    else if (arg === '--cert') opts.cert = value();
    else if (arg === '--key') opts.key = value();
    else if (arg === '-h' || arg === '--help') opts.help = true;
    else opts.rest.push(arg);
  }
  if (!Number.isInteger(opts.topK) || opts.topK < 1) throw new UsageError(`--top-k must be a positive integer, got ${opts.topK}`);
  if (!(opts.timeout > 0)) throw new UsageError(`--timeout must be a positive number of seconds, got ${opts.timeout}`);
  if ((opts.cert || opts.key) && !(opts.cert && opts.key && opts.ca)) {
    throw new UsageError('a client certificate (mTLS) needs --cert, --key and the server\'s CA (--ca)');
  }
  opts.token = opts.tokenFile ? readSecret(opts.tokenFile, 'token file (--token-file, RAGR1_CLIENT_TOKEN_FILE)') : '';
  return opts;
}

// A file's content, stripped (as the Python client reads its token file); an error names the file.
function readSecret(file, what) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8').trim();
  } catch (err) {
    throw new UsageError(`${what} ${file}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`);
  }
  if (!text) throw new UsageError(`${what} ${file} is empty`);
  return text;
}

function readFile(file, what) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new UsageError(`${what} ${file}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`);
  }
}

function retrieverService(protoDir) {
  const file = path.join(protoDir, 'ragr1', 'v1', 'retriever.proto');
  if (!fs.existsSync(file)) {
    throw new UsageError(`${file} not found: give the repository's proto/ folder with --proto DIR`);
  }
  let definition;
  try {
    definition = protoLoader.loadSync(file, {
      includeDirs: [protoDir],
      keepCase: true, // field names as in the .proto (top_k, num_shards)
      longs: Number,
      defaults: true,
    });
  } catch (err) {
    throw new UsageError(`${file}: ${String(err.message).replace(/\s+/g, ' ')}`);
  }
  return grpc.loadPackageDefinition(definition).ragr1.v1.Retriever;
}

function credentials(opts) {
  if (!opts.ca) {
    if (opts.token) console.error('warning: sending a bearer token without TLS');
    return grpc.credentials.createInsecure();
  }
  const channel = grpc.credentials.createSsl(
    readFile(opts.ca, 'CA file (--ca, RAGR1_CLIENT_CA_FILE)'),
    opts.key ? readFile(opts.key, 'key file (--key, RAGR1_CLIENT_KEY_FILE)') : null,
    opts.cert ? readFile(opts.cert, 'certificate file (--cert, RAGR1_CLIENT_CERT_FILE)') : null,
  );
  if (!opts.token) return channel;
  const bearer = grpc.credentials.createFromMetadataGenerator((_, done) => {
    const metadata = new grpc.Metadata();
    metadata.set('authorization', `Bearer ${opts.token}`);
    done(null, metadata);
  });
  return grpc.credentials.combineChannelCredentials(channel, bearer);
}

// gRPC's own message, on one line, without the empty "Resolution note:" grpc-js ends an UNAVAILABLE with.
function oneLine(details) {
  return String(details).replace(/\s+/g, ' ').replace(/\s*Resolution note:\s*$/, '').trim();
}

function main() {
  let opts;
  let Retriever;
  let channelCredentials;
  try {
    opts = parseArgs(process.argv.slice(2));
    if (opts.help || opts.rest.length < 2) {
      console.error(USAGE);
      return process.exit(opts.help ? 0 : 2);
    }
    Retriever = retrieverService(opts.proto);
    channelCredentials = credentials(opts);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    console.error(`search.js: error: ${err.message}`);
    return process.exit(2);
  }
  const [address, ...queries] = opts.rest;
  const client = new Retriever(address, channelCredentials);
  const metadata = new grpc.Metadata();
  if (opts.token && !opts.ca) metadata.set('authorization', `Bearer ${opts.token}`);
  const deadline = new Date(Date.now() + opts.timeout * 1000);
  client.Search({ queries, top_k: opts.topK }, metadata, { deadline }, (err, reply) => {
    client.close();
    if (err) {
      const message = oneLine(err.details);
      console.error(`ragr1.v1.Retriever/Search at ${address}: ${grpc.status[err.code]}: ${message}`);
      return process.exit(1);
    }
    if (opts.json) {
      console.log(JSON.stringify(reply));
      return;
    }
    reply.results.forEach((result, i) => {
      console.log(`${queries[i]}`);
      result.passages.forEach((p, rank) => {
        const text = p.text.length > 200 ? `${p.text.slice(0, 200)}...` : p.text;
        console.log(`  ${rank + 1}. ${p.title} [${p.id}] score ${p.score.toFixed(3)}`);
        if (text) console.log(`     ${text}`);
      });
    });
    if (reply.partial) console.log(`(partial: shards ${reply.missing_shards.join(', ')} did not answer)`);
  });
}

main();
