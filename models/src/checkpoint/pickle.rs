//! A small pickle reader for torch state dicts (`<stem>/data.pkl` inside `torch.save`'s zip).
//!
//! The input is untrusted, so this is not a general unpickler: it knows only the opcodes that
//! pickle protocols 2-4 use for plain data, and only the globals a state dict needs
//! (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` / `_rebuild_parameter[_with_state]`
//! and the typed `torch.*Storage` classes referenced through `BINPERSID`). Anything else is a
//! typed error. Containers are reference counted so that memo lookups cost O(1), and a work
//! budget bounds copy-on-write of shared containers.

use std::rc::Rc;

/// Element type of a torch storage, from its class name (`torch.FloatStorage`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageDtype {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl StorageDtype {
    fn from_class_name(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => Self::F32,
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::BF16,
            "DoubleStorage" => Self::F64,
            "LongStorage" => Self::I64,
            "IntStorage" => Self::I32,
            "ShortStorage" => Self::I16,
            "CharStorage" => Self::I8,
            "ByteStorage" => Self::U8,
            "BoolStorage" => Self::Bool,
            _ => return None,
        })
    }

    pub(crate) fn size_bytes(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
        }
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16 | Self::F64)
    }
}

/// A storage named by a persistent id `('storage', type, key, location, numel)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StorageRef {
    pub(crate) dtype: StorageDtype,
    /// File name under `<stem>/data/`.
    pub(crate) key: String,
    /// Declared element count (checked against the stored bytes by the caller).
    pub(crate) numel: u64,
}

/// A tensor view of a storage, as `_rebuild_tensor_v2` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorRef {
    pub(crate) storage: StorageRef,
    /// In elements.
    pub(crate) offset: u64,
    pub(crate) shape: Vec<usize>,
    /// In elements.
    pub(crate) stride: Vec<usize>,
}

/// Why `data.pkl` was rejected, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PickleError {
    pub(crate) offset: usize,
    pub(crate) problem: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    RebuildParameterWithState,
    Storage(StorageDtype),
}

impl Global {
    fn resolve(module: &str, name: &str) -> Option<Self> {
        match (module, name) {
            ("collections", "OrderedDict") => Some(Self::OrderedDict),
            ("torch._utils", "_rebuild_tensor_v2") => Some(Self::RebuildTensorV2),
            ("torch._utils", "_rebuild_parameter") => Some(Self::RebuildParameter),
            ("torch._utils", "_rebuild_parameter_with_state") => {
                Some(Self::RebuildParameterWithState)
            }
            ("torch", class) => StorageDtype::from_class_name(class).map(Self::Storage),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Value {
    None,
    Bool,
    Int(i64),
    Float,
    Str(Rc<str>),
    Bytes,
    Tuple(Rc<Vec<Value>>),
    List(Rc<Vec<Value>>),
    Dict(Rc<Vec<(Value, Value)>>),
    Global(Global),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorRef>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool => "bool",
            Value::Int(_) => "int",
            Value::Float => "float",
            Value::Str(_) => "str",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Global(_) => "global",
            Value::Storage(_) => "storage",
            Value::Tensor(_) => "tensor",
        }
    }
}

/// Most elements that copy-on-write of shared containers may copy in total.
const COPY_BUDGET: usize = 1 << 24;

/// Parses a state-dict pickle into `(name, tensor)` pairs in file order.
pub(crate) fn parse_state_dict(bytes: &[u8]) -> Result<Vec<(String, TensorRef)>, PickleError> {
    let mut machine = Machine {
        input: bytes,
        pos: 0,
        op_start: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: std::collections::HashMap::new(),
        copy_budget: COPY_BUDGET,
    };
    let top = machine.run()?;
    let Value::Dict(items) = top else {
        return Err(PickleError {
            offset: 0,
            problem: format!("top-level object is a {}, expected a dict", top.kind()),
        });
    };
    let mut out = Vec::with_capacity(items.len());
    for (key, value) in items.iter() {
        let Value::Str(name) = key else {
            return Err(PickleError {
                offset: 0,
                problem: format!("state-dict key is a {}, expected a str", key.kind()),
            });
        };
        let Value::Tensor(tensor) = value else {
            return Err(PickleError {
                offset: 0,
                problem: format!(
                    "state-dict entry `{name}` is a {}, expected a tensor",
                    value.kind()
                ),
            });
        };
        out.push((name.to_string(), TensorRef::clone(tensor)));
    }
    Ok(out)
}

struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    op_start: usize,
    stack: Vec<Value>,
    /// Stack heights at each MARK.
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, Value>,
    copy_budget: usize,
}

impl Machine<'_> {
    fn err(&self, problem: impl Into<String>) -> PickleError {
        PickleError {
            offset: self.op_start,
            problem: problem.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.input.len())
            .ok_or_else(|| self.err(format!("needs {n} more bytes, input ends")))?;
        let slice = &self.input[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take_array::<1>()?[0])
    }

    fn u32_le(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn u64_le(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    fn len_from(&self, n: u64) -> Result<usize, PickleError> {
        usize::try_from(n).map_err(|_| self.err(format!("length {n} is too large")))
    }

    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.input[self.pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            return Err(self.err("unterminated text line"));
        };
        let text = std::str::from_utf8(&rest[..nl])
            .map_err(|_| self.err("text line is not UTF-8"))?
            .to_string();
        self.pos += nl + 1;
        Ok(text)
    }

    fn utf8(&mut self, n: usize) -> Result<Value, PickleError> {
        let offset = self.op_start;
        let bytes = self.take(n)?;
        let text = std::str::from_utf8(bytes)
            .map_err(|_| PickleError {
                offset,
                problem: "string is not UTF-8".to_string(),
            })?
            .into();
        Ok(Value::Str(text))
    }

    /// Protocol-2 `str` from Python 2 pickles: bytes, read as Latin-1.
    fn latin1(&mut self, n: usize) -> Result<Value, PickleError> {
        let text: String = self.take(n)?.iter().map(|&b| char::from(b)).collect();
        Ok(Value::Str(text.into()))
    }

    fn push(&mut self, v: Value) {
        self.stack.push(v);
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top_mut(&mut self) -> Result<&mut Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        let offset = self.op_start;
        self.stack.last_mut().ok_or(PickleError {
            offset,
            problem: "stack underflow".to_string(),
        })
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        if mark > self.stack.len() {
            return Err(self.err("MARK above the stack top"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self
            .stack
            .last()
            .cloned()
            .ok_or_else(|| self.err("memoizing an empty stack"))?;
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(&key)
            .cloned()
            .ok_or_else(|| self.err(format!("memo key {key} was never stored")))?;
        self.push(v);
        Ok(())
    }

    /// Charges copy-on-write of a shared container of `len` elements to the budget.
    fn charge_copy(&mut self, shared: bool, len: usize) -> Result<(), PickleError> {
        if shared {
            self.copy_budget = self
                .copy_budget
                .checked_sub(len)
                .ok_or_else(|| self.err("too much copying of shared containers"))?;
        }
        Ok(())
    }

    fn set_items(&mut self, pairs: Vec<Value>) -> Result<(), PickleError> {
        if !pairs.len().is_multiple_of(2) {
            return Err(self.err("SETITEMS with an odd number of values"));
        }
        let offset = self.op_start;
        let (shared, len) = match self.top_mut()? {
            Value::Dict(d) => (Rc::strong_count(d) > 1, d.len()),
            other => {
                let kind = other.kind();
                return Err(PickleError {
                    offset,
                    problem: format!("SETITEM on a {kind}"),
                });
            }
        };
        self.charge_copy(shared, len)?;
        if let Value::Dict(d) = self.top_mut()? {
            let d = Rc::make_mut(d);
            let mut it = pairs.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                d.push((k, v));
            }
        }
        Ok(())
    }

    fn append_items(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let offset = self.op_start;
        let (shared, len) = match self.top_mut()? {
            Value::List(l) => (Rc::strong_count(l) > 1, l.len()),
            other => {
                let kind = other.kind();
                return Err(PickleError {
                    offset,
                    problem: format!("APPEND on a {kind}"),
                });
            }
        };
        self.charge_copy(shared, len)?;
        if let Value::List(l) = self.top_mut()? {
            Rc::make_mut(l).extend(items);
        }
        Ok(())
    }

    fn global(&self, module: &str, name: &str) -> Result<Value, PickleError> {
        Global::resolve(module, name)
            .map(Value::Global)
            .ok_or_else(|| self.err(format!("global `{module}.{name}` is not allowed")))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.op_start = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return Err(self.err(format!("pickle protocol {proto} is unknown")));
                    }
                }
                0x95 => {
                    self.u64_le()?; // FRAME: a length hint only
                }
                b'.' => {
                    let top = self.pop()?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self.err("STOP with values left on the stack"));
                    }
                    return Ok(top);
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let v = self.global(&module, &name)?;
                    self.push(v);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Value::Str(module), Value::Str(name)) = (module, name) else {
                        return Err(self.err("STACK_GLOBAL needs two strings"));
                    };
                    let v = self.global(&module, &name)?;
                    self.push(v);
                }
                b'q' => {
                    let k = self.u8()?;
                    self.memo_put(u64::from(k))?;
                }
                b'r' => {
                    let k = self.u32_le()?;
                    self.memo_put(u64::from(k))?;
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let k = self.u8()?;
                    self.memo_get(u64::from(k))?;
                }
                b'j' => {
                    let k = self.u32_le()?;
                    self.memo_get(u64::from(k))?;
                }
                b'(' => self.marks.push(self.stack.len()),
                b')' => self.push(Value::Tuple(Rc::new(Vec::new()))),
                b'}' => self.push(Value::Dict(Rc::new(Vec::new()))),
                b']' => self.push(Value::List(Rc::new(Vec::new()))),
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(Rc::new(items)));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(Rc::new(items)));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Rc::new(Vec::new())));
                    self.set_items(items)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Value::Tuple(Rc::new(items)));
                }
                b'X' => {
                    let n = self.u32_le()?;
                    let n = self.len_from(u64::from(n))?;
                    let v = self.utf8(n)?;
                    self.push(v);
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    let v = self.utf8(n)?;
                    self.push(v);
                }
                0x8d => {
                    let n = self.u64_le()?;
                    let n = self.len_from(n)?;
                    let v = self.utf8(n)?;
                    self.push(v);
                }
                b'U' => {
                    let n = usize::from(self.u8()?);
                    let v = self.latin1(n)?;
                    self.push(v);
                }
                b'T' => {
                    let n = self.u32_le()?;
                    let n = self.len_from(u64::from(n))?;
                    let v = self.latin1(n)?;
                    self.push(v);
                }
                b'B' => {
                    let n = self.u32_le()?;
                    let n = self.len_from(u64::from(n))?;
                    self.take(n)?;
                    self.push(Value::Bytes);
                }
                b'C' => {
                    let n = usize::from(self.u8()?);
                    self.take(n)?;
                    self.push(Value::Bytes);
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.take_array()?);
                    self.push(Value::Int(i64::from(v)));
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.take_array()?);
                    self.push(Value::Int(i64::from(v)));
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    if n > 8 {
                        return Err(self.err(format!("LONG1 of {n} bytes does not fit in i64")));
                    }
                    let bytes = self.take(n)?;
                    let mut buf = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
                        [0xffu8; 8]
                    } else {
                        [0u8; 8]
                    };
                    buf[..n].copy_from_slice(bytes);
                    self.push(Value::Int(i64::from_le_bytes(buf)));
                }
                b'G' => {
                    self.take(8)?;
                    self.push(Value::Float);
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool),
                0x89 => self.push(Value::Bool),
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append_items(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append_items(items)?;
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top_mut()?.clone();
                    self.push(v);
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = self.persistent_storage(&pid)?;
                    self.push(Value::Storage(Rc::new(storage)));
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(&callable, &args)?;
                    self.push(v);
                }
                b'b' => {
                    // BUILD sets attributes; a state dict's OrderedDict carries `_metadata`
                    // (module versions) and parameters may carry Python attributes. Neither
                    // matters for the weights.
                    let _state = self.pop()?;
                    let target = self.top_mut()?.kind();
                    if !matches!(target, "dict" | "tensor") {
                        return Err(self.err(format!("BUILD on a {target}")));
                    }
                }
                other => {
                    return Err(self.err(format!("opcode 0x{other:02x} is not supported")));
                }
            }
        }
    }

    /// `('storage', <torch.XStorage>, key, location, numel)`.
    fn persistent_storage(&self, pid: &Value) -> Result<StorageRef, PickleError> {
        let bad = || self.err("persistent id is not ('storage', type, key, location, numel)");
        let Value::Tuple(items) = pid else {
            return Err(bad());
        };
        let [kind, class, key, _location, numel] = items.as_slice() else {
            return Err(bad());
        };
        let (Value::Str(kind), Value::Global(class), Value::Str(key), Value::Int(numel)) =
            (kind, class, key, numel)
        else {
            return Err(bad());
        };
        if &**kind != "storage" {
            return Err(bad());
        }
        let Global::Storage(dtype) = class else {
            return Err(self.err("persistent id names a class that is not a storage"));
        };
        let numel = u64::try_from(*numel)
            .map_err(|_| self.err(format!("negative storage size {numel}")))?;
        if key.is_empty() || key.contains(['/', '\\']) || key.contains("..") {
            return Err(self.err(format!("storage key `{key}` is not a plain file name")));
        }
        Ok(StorageRef {
            dtype: *dtype,
            key: key.to_string(),
            numel,
        })
    }

    fn reduce(&self, callable: &Value, args: &Value) -> Result<Value, PickleError> {
        let Value::Global(global) = callable else {
            return Err(self.err(format!("REDUCE calls a {}", callable.kind())));
        };
        let Value::Tuple(args) = args else {
            return Err(self.err(format!("REDUCE arguments are a {}", args.kind())));
        };
        match global {
            Global::OrderedDict if args.is_empty() => Ok(Value::Dict(Rc::new(Vec::new()))),
            Global::OrderedDict => Err(self.err("OrderedDict called with arguments")),
            Global::RebuildTensorV2 => self.rebuild_tensor(args),
            Global::RebuildParameter | Global::RebuildParameterWithState => match args.first() {
                Some(t @ Value::Tensor(_)) if (3..=4).contains(&args.len()) => Ok(t.clone()),
                _ => Err(self.err("_rebuild_parameter needs (tensor, requires_grad, hooks)")),
            },
            Global::Storage(_) => Err(self.err("storage classes cannot be called")),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`.
    fn rebuild_tensor(&self, args: &[Value]) -> Result<Value, PickleError> {
        if !(6..=7).contains(&args.len()) {
            return Err(self.err(format!(
                "_rebuild_tensor_v2 takes 6 or 7 arguments, got {}",
                args.len()
            )));
        }
        let Value::Storage(storage) = &args[0] else {
            return Err(self.err(format!(
                "_rebuild_tensor_v2 storage is a {}",
                args[0].kind()
            )));
        };
        let Value::Int(offset) = args[1] else {
            return Err(self.err("_rebuild_tensor_v2 offset is not an int"));
        };
        let offset =
            u64::try_from(offset).map_err(|_| self.err(format!("negative offset {offset}")))?;
        let shape = self.dims(&args[2], "size")?;
        let stride = self.dims(&args[3], "stride")?;
        if shape.len() != stride.len() {
            return Err(self.err(format!(
                "size has {} dims but stride has {}",
                shape.len(),
                stride.len()
            )));
        }
        Ok(Value::Tensor(Rc::new(TensorRef {
            storage: StorageRef::clone(storage),
            offset,
            shape,
            stride,
        })))
    }

    fn dims(&self, v: &Value, what: &str) -> Result<Vec<usize>, PickleError> {
        let Value::Tuple(items) = v else {
            return Err(self.err(format!("tensor {what} is a {}, expected a tuple", v.kind())));
        };
        items
            .iter()
            .map(|item| match item {
                Value::Int(n) => usize::try_from(*n)
                    .map_err(|_| self.err(format!("tensor {what} has a negative entry {n}"))),
                other => Err(self.err(format!("tensor {what} has a {} entry", other.kind()))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `OrderedDict({'w': _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 6), 0, (2, 3), (3, 1), False, OrderedDict())})`
    fn minimal_pickle() -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend_from_slice(b"ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00w");
        p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storage");
        p.extend_from_slice(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ");
        p.extend_from_slice(b"K\x00K\x02K\x03\x86K\x03K\x01\x86\x89h\x00)RtRu.");
        p
    }

    #[test]
    fn parses_a_minimal_state_dict() {
        let parsed = parse_state_dict(&minimal_pickle()).expect("valid pickle");
        assert_eq!(parsed.len(), 1);
        let (name, t) = &parsed[0];
        assert_eq!(name, "w");
        assert_eq!(t.shape, vec![2, 3]);
        assert_eq!(t.stride, vec![3, 1]);
        assert_eq!(t.storage.dtype, StorageDtype::F32);
        assert_eq!(t.storage.numel, 6);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let p = minimal_pickle();
        for cut in 0..p.len() {
            assert!(parse_state_dict(&p[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn every_single_byte_corruption_is_handled() {
        let p = minimal_pickle();
        for i in 0..p.len() {
            for b in [0x00, 0x28, 0x2e, 0x52, 0x63, 0x71, 0x80, 0xff] {
                let mut q = p.clone();
                q[i] = b;
                // Some corruptions still parse (e.g. a changed name); none may panic.
                let _ = parse_state_dict(&q);
            }
        }
    }

    #[test]
    fn rejects_unknown_globals() {
        let p = b"\x80\x02cos\nsystem\nq\x00.";
        let err = parse_state_dict(p).expect_err("os.system must be refused");
        assert!(err.problem.contains("os.system"), "{}", err.problem);
    }

    #[test]
    fn memo_sharing_does_not_blow_up() {
        // A list appended to itself through the memo many times: O(1) per step thanks to Rc.
        let mut p = b"\x80\x02]q\x00".to_vec();
        for _ in 0..10_000 {
            p.extend_from_slice(b"h\x00a");
        }
        p.push(b'.');
        let err = parse_state_dict(&p).expect_err("a list is not a state dict");
        assert!(err.problem.contains("top-level"), "{}", err.problem);
    }
}
