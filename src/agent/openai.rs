//! openai
pub struct OpenAiAgent;
